"""Backstop's fault-tolerance policy core: pure Python, no Django imports.

Modules: `config` (PolicyConfig), `priority` (P_i), `resources` (idle rates, Q, cluster rates),
`placement` (Algorithms 1 and 2), `actions` (what a cycle proposes), `checkpoint` (adaptive
interval and its Spark mapping), `prediction` (fault-rate regression), `recovery` (measuring a
recovery), `truth` (ground truth of a job's output, and auditing it), `explain` (the dry run
behind `manage.py policy_explain`). See docs/POLICY.md.
"""
