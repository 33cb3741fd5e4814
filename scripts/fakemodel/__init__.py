"""Fake model servers for the real agent CLIs, on 127.0.0.1, scripted by markers in the prompt."""
