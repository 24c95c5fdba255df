"""Write the full-profile rehearsal table (issue 14, item 2) from the runner's records of the given runs.

    python docs/rehearsal/table.py reh-brink_kg_statistics reh-closed_book ...   # writes docs/rehearsal/rehearsal.{md,csv}, stages.csv
    python docs/rehearsal/table.py --append reh-coe-n10 ...                 # keeps the rows of other runs already in the csv files
"""
import sys
from pathlib import Path

import pandas as pd

from kgrag_nb.plan import rehearsal_table
from kgrag_nb.reproduce import markdown_table

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":
    append = "--append" in sys.argv
    runs = [a for a in sys.argv[1:] if a != "--append"]
    nbs, stages = rehearsal_table(runs)
    if append:  # rows of earlier rehearsals (their run folders may live elsewhere) stay; these runs' rows are replaced
        old_n, old_s = pd.read_csv(HERE / "rehearsal.csv", keep_default_na=False), pd.read_csv(HERE / "stages.csv", keep_default_na=False)
        nbs = pd.concat([old_n[~old_n["run"].isin(runs)], nbs], ignore_index=True)
        stages = pd.concat([old_s[~old_s["run"].isin(runs)], stages], ignore_index=True)
    nbs.to_csv(HERE / "rehearsal.csv", index=False); stages.to_csv(HERE / "stages.csv", index=False)
    shown = nbs.assign(stopped_in=nbs["stopped_in"].astype(str).str.slice(0, 160))
    big = stages[(pd.to_numeric(stages["wall_s"]) >= 5) | (pd.to_numeric(stages["requests"]) > 0)] if len(stages) else stages
    (HERE / "rehearsal.md").write_text(
        "**Full-profile rehearsal against `kgrag serve stub` (TEST INSTRUMENT: answers are words of the prompt, not a "
        "language model), shared 2-core CPU machine, nice 19; runs `reh-coe-*`, `reh-misk*`: niced, under load, stub = "
        "TEST INSTRUMENT, CoE at reduced `n_records` (see README); runs `reh4-*` (fourth session): fresh clones, "
        "2-3 rehearsals at once, CoE at full size, `reh4-brink4` with `label_modes=[\"private_id\"]`**\n\n" + markdown_table(shown, ".1f")
        + "\n\n**Stages (executed cells) of at least 5 s or with LLM requests**\n\n" + markdown_table(big, ".1f") + "\n")
    print(shown.to_string())
