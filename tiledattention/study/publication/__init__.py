"""The study as a Zenodo-ready bundle: create and verify (sharing prose and archive), the
manifest of the runs, and the publication metadata (.zenodo.json, CITATION.cff, RO-Crate)."""
