"""Test doubles that speak the real protocols: a fake registry over HTTPS, real GPG keys."""
