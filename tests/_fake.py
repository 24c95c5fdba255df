"""What the tests' scripted clients share: answering `complete(..., return_records=True)` like `LLMClient.complete`."""
import functools


def with_records(complete):
    "A scripted client's `complete(prompts, **kw) -> outputs`, also answering `return_records=True` with (outputs, records)."
    @functools.wraps(complete)
    def wrapped(self, prompts, *args, return_records=False, **kw):
        outs = complete(self, prompts, *args, **kw)
        if not return_records: return outs
        return outs, [[{"text": o, "finish_reason": "stop", "cached": False} for o in row] for row in outs]
    return wrapped
