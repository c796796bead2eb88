"""From benchmark rows to a citable record, one room per concern: presentation/ (the report
from rows: tables, figures, the headline), publication/ (the bundle: create, verify, manifest,
metadata), references/ (compare, reproduce, systems, scaling against references), advice/
(``tiledattn advise``); profile and profile_target are the Nsight stage, timeline the run log."""
