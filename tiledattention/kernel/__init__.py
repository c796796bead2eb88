"""The call path below ``sdpa``: the per-call plan, the launch, and the cuTile kernel.

``plan`` turns a call into a cached launch plan (one dict lookup on a repeat call);
``launch`` runs it; ``params`` builds the kernel's arguments by name from its signature;
``variant`` and ``compile`` name and compile a specialisation; ``attention`` is the tile
program; ``toolchain`` finds cuTile and tileiras.
"""
