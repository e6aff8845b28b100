"""Bridges from recorded sessions to other trainers' own data structures.

Each bridge lives in its own module and imports its trainer lazily from there, so importing this
package costs nothing and needs none of them. ``integrations.verifiers`` feeds records into
verifiers 0.4's message graph; it must run in an environment that has ``verifiers`` installed.
"""
