"""From benchmark rows to a citable record: tables, figures, profiles, manifest, bundle."""
