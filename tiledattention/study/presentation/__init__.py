"""The study's report from its rows: the rows table, the tables (the headline among them),
the figures; report.write_report is what `tiledattn aggregate` runs."""
