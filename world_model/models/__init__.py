"""The predictors: the 4-tensor model, the flat baseline, the low-rank attention family, their kernels, readout
(decoding) policies and the checkpoint folder format."""
