"""End-to-end tests: real engines (the suite's CPU llama-server build, the recorded-contract Lucebox
stand-in) served through lucebox, driven by real clients."""
