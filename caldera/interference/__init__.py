"""Interference-aware GPU sharing: profile records, the decay model and what the scheduler is told about it.

* :mod:`.records`: the job types and the co-location samples (Gavel's measured pairs, or the platform's profiles).
* :mod:`.features`: pure feature extraction from solo profiles (no ML stack).
* :mod:`.predictor`: the :class:`~.predictor.Predictor` interface, the predicted decay of every job in a mix.
* :mod:`.store`: the versioned model file the live loop and the simulator load.
* :mod:`.train`: training and evaluation (needs the optional extra ``interference``: scikit-learn).
"""
