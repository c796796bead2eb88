"""A study held against references: compare (the shipped reference tuples beside it),
reproduce a bundle, systems side by side, scaling over GPU counts."""
