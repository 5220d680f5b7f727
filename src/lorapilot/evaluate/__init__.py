"""Evaluation: predictions (`predict`: label scoring and greedy generation; images:
`image_predict`), pure metrics (`metrics`, `structured`, `leaves`, `values`; `served`: a
scored classifier's answers as a generating server gives them), pre-registered
guards (`guards`), the runner that evaluates a split, the records it writes, the linear probe
for image baselines, and one evaluation inside a run (`session`, `image_session`: a layer
above, as they load a model through the modality seam)."""
