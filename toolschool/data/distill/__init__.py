"""`toolschool distill`: exploration trials -> a training dataset (filter, judge, dedupe, paraphrase, split).

Steps, each counted per tool in `summary.json` and the dataset card (`README.md`) next to the data; the filters'
yield (how many entered each, how many it removed and why, in order) is `summary["yield"]`, a table of the card,
and printed by `toolschool distill`:

1. **rules** — keep a trial whose final answer follows a call that executed without error, and in which the
   explored tool itself was called successfully, unless the explorer's own reflection said it did not fulfil the
   request (`require_solved`: unless it said it did), and (`require_answer`) whose final answer states a short tool
   result as eval's answer accuracy reads it, and whose request does not already state it; a trial imagined values
   first (`[explore] imagine`) is judged instead by whether the call read from the request had the values the
   request was written from. The training conversation is the clean path: the query, the steps whose calls all
   executed, the final answer (failed attempts are not taught).
2. **grounding** (`require_grounded`) — every argument value of every call is stated in, or derivable from, the
   request (or an earlier result of the same conversation): numbers, dates in any spelling, units, names, a
   calculator expression's numbers, a python program's literals (`toolschool.data.filters`).
3. **echo** — a request that copies a sentence of the exploration prompts, a worked example, or a tool's
   description is not a user's request (`toolschool.data.filters`).
4. **judge** (optional, any backend) — Yes/No with a reason on three criteria (the answer addresses the
   query informatively; it is faithful to the execution results; the tools were used appropriately). Every
   judgment, kept or not, goes to `judgments.jsonl`; kept lines carry theirs in `meta.judge`.
5. **round trip** (`round_trip`, with an explorer model: `explorer_model`, else the run's explorer, else the
   judge) — that model, given only the request and the tools in a fresh context, writes an equivalent first call
   (`toolschool.data.round_trip`).
6. **dedupe** — near-identical queries per tool (the tokens of `dataset.same_request_key`: case-folded words,
   numbers and arithmetic operators; the same key, or token-set Jaccard >= threshold with the same numbers and
   operators in the same order).
7. **paraphrase** (optional, any backend) — up to `target_per_tool` per tool, at most `max_paraphrases` per
   original; a paraphrase is rejected when it is empty, the original again (`same_request_key`), repeats the
   paraphrasing prompt's instructions, states the answer (the final answer or the last tool result) instead of
   asking, drops a number, date, unit, name or quoted value the call arguments take from the query (or the month
   of a date the query names), adds a number neither the query nor the call has (it would ask for another call),
   puts a unit or name next to another number than in the query ("5 miles in km" for "5 km in miles"), is cut off
   at `paraphrase_max_tokens`, or repeats a query or paraphrase of the tool (of any original). With an explorer
   model and `paraphrase_round_trip`, a paraphrase that passes is read back: that model, made to call the
   original's tool (a named tool_choice), must write the original's arguments from the paraphrase alone (one that
   turns a conversion or a date's direction around fails). With a judge, each paraphrase that passes is judged
   too (the same request? Yes/No + reason, `paraphrase_judgments.jsonl`) and kept
   only on Yes. Every rejection is counted with its reason in `summary.json` and the card.
8. **split** — train / validation by original query, so an original and its paraphrases stay together (and
   originals sharing a query text across tools too: no query is in both splits).
9. **no-tool lines** (`toolschool.data.irrelevance`) — `irrelevance_fraction` of the tool lines again with the
   tools that fit taken away, answered "no offered tool fits" (in their request's split), and, with an explorer
   model, `chitchat_fraction` of them as chit-chat it imagines and answers without tools; `out_of_scope_fraction`
   of them as requests for a service no offered tool gives (a fixed list of tasks), answered that none can.

Grounding and echo details and each round trip's reply go to `filtered.jsonl`.

Judge and paraphraser replies are cached append-only (`cache.jsonl`), so an interrupted run resumes
without asking the model again; a rerun whose paraphrase plan changed (more trials, another target) reuses the
cached paraphrases and asks only for the samples it lacks.

Modules: `rules` (step 1; the trial record is `toolschool.explore.trial`'s), `judge` (step 4, and the paraphrase
judge of step 7), `dedupe` (6), `paraphrase` (7), `split` (8); `runner` runs every step over a list of trials
(`distill`, `run_distill`), `stage` on a run config and the trial log it is handed (`run_distill_stage`);
`options` (`DistillOptions`), `summary` (what `summary.json` counts, each filter's yield, `nothing_to_train`), `card`
(the dataset card); `templates` renders the prompts in `prompts/*.jinja`. Steps 2, 3, 5 and 9 live beside this
package (`toolschool.data.filters`, `toolschool.data.round_trip`, `toolschool.data.irrelevance`).
"""
