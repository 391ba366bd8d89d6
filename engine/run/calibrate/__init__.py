"""Measuring on the user's card while a server runs, once no client asks.

- ``probing``: what every calibration shares (the run it measures, the probe sender that gives
  way to clients, lucebox's own requests); ``calibrator``: the speculation calibration;
  ``enginecalibrator``: both engines, where both can serve; ``kvcalibrator``: a long context's
  modes on the Lucebox engine; ``calibration``: which speculation serves, from the rates (pure);
  ``probes``: the probe set.
"""
