"""Bindings of the kernel into other libraries (optional extras)."""
