"""The engine's C++ sources, built by extensions.py; the other modules are typed calls of their ops."""
