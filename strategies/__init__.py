"""Each paper's server side as a Flower strategy, their shared base and the strategy catalogue."""
