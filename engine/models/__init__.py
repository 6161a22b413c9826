"""Model implementations (one decoder class covers the supported families)."""
