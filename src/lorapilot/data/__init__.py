"""The data step's engines: loading records from files or HF `datasets`, validating rows and
targets, cleaning, the seeded stratified split, duplicates and leaks between splits, the data
version (hashes), the formatted examples after the exact preprocessing, and for images their
properties and near duplicates. Imports the spec, records and the root helpers only."""
