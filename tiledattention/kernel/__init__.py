"""The call path below ``sdpa``: the per-call plan, the launch, and the cuTile kernel.

``plan`` turns a call into a cached launch plan, forward or backward (one dict lookup on
a repeat call); ``launch`` runs it; ``spec`` places the kernel's arguments by name from its
signature; ``variant`` and ``compile`` name and compile a specialisation; ``flags`` names
the compile-time flags each kernel family reads, ``visit`` the tiles each program visits;
``attention`` and ``backward`` are the tile programs built from ``body``; ``toolchain``
finds cuTile and tileiras and checks the GPU.
"""
