"""absl experiment scripts: seed sweeps and agent comparisons over the same builder."""
