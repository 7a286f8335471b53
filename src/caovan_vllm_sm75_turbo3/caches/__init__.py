"""The isolated JIT cache store: environment key, directory layout, manifest, locks and cleaning."""
