"""Pictures drawn with matplotlib (the `plot` extra), one module per kind: `sample`
(`show KEY`: the picture that suits a sample's shape), `grids` (feature-map grids and
attention heads), `charts` (heatmaps of rows, vectors, histograms, a number), `curves`
(`show --depth` and `diff --plot`: statistics and errors key by key); `canvas` what they
share."""
