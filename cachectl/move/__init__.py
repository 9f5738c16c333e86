"""Moving entries where no shared directory reaches: export and import of bundles."""
