"""Conformance: tenure's lockstep proof against your own database."""
