"""The deliverable: the pilot's state gathered from its run records (`collect`), the limitations
it names (`limitations`), the sections
of the report (one module per section family under `sections/`), the HTML and Markdown
renderers with their blocks, plots and style, and the deliverable folder. Imports the
decision rule and plan, evaluation's pure metrics, records and the spec; never a step."""
