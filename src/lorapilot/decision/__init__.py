"""The experiment plan and the decision it ends in: the pre-registered variants, their step
shapes and the selection rule (`plan`), what a variant's seed replicates say together
(`seeds`, pure), the GO / NO-GO / INCONCLUSIVE rule applied to
metrics, guards and the paired bootstrap (`rule`, pure), and verify's fresh-process reload of
an adapter onto its pinned base (`reload`, which sits a layer above: it loads a model through
the modality seam). Imports evaluation's pure scorers, the base, records and the spec."""
