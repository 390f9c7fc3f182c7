"""The synthetic world: scenes simulated and rendered as clips with one true sentence per second, and its sentences
as training windows."""
