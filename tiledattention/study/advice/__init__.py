"""`tiledattn advise`: a shape's prediction from the nearest measured points (measured/)."""
