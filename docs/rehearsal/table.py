"""Write the full-profile rehearsal table (issue 14, item 2) from the runner's records of the given runs.

    python docs/rehearsal/table.py reh-kg_statistics reh-closed_book ...   # writes docs/rehearsal/rehearsal.{md,csv}, stages.csv
"""
import sys
from pathlib import Path

from kgrag_nb.plan import rehearsal_table
from kgrag_nb.reproduce import markdown_table

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":
    runs = sys.argv[1:]
    nbs, stages = rehearsal_table(runs)
    nbs.to_csv(HERE / "rehearsal.csv", index=False); stages.to_csv(HERE / "stages.csv", index=False)
    shown = nbs.assign(stopped_in=nbs["stopped_in"].str.slice(0, 160))
    big = stages[(stages["wall_s"] >= 5) | (stages["requests"] > 0)] if len(stages) else stages
    (HERE / "rehearsal.md").write_text(
        "**Full-profile rehearsal against `kgrag serve stub` (TEST INSTRUMENT: answers are words of the prompt, not a "
        "language model), shared 2-core CPU machine, nice 19**\n\n" + markdown_table(shown, ".1f")
        + "\n\n**Stages (executed cells) of at least 5 s or with LLM requests**\n\n" + markdown_table(big, ".1f") + "\n")
    print(shown.to_string())
