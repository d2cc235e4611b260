"""The provider service: version lists and download documents, each release's signed SHA256SUMS,
the verification chain, verified archives fetched once for the fleet, and `Mirror`, what the handlers call."""
