"""Test doubles that reproduce real wire formats where the real thing cannot run here.

Everything under this package exists for tests, benchmarks and demos: the reference engine (a CPU
stand-in for vLLM's OpenAI server) and other emulators. Product code never imports it; it may
import product code (for example ``openenv_harness.contract``) but nothing here is on a
production path.
"""
