"""Compare and report: gather the pilot state from its records, render the deliverable."""
