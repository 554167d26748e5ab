"""``gpuwarden demo``: the agent, the scheduler and remediation together on one machine, no GPU needed.

Why a package of its own, at the top level beside ``agent`` and
``scheduler``: the demo runs both (many simulated agents and the scheduler
with remediation, in one process, against one local API server), and the
two must never import each other, nor may the shared core ``gpuwarden``
import either (``tests/test_layout.py``). ``demo`` is the one package
allowed to import all three; nothing imports ``demo``. Its subcommand
registers through the ``gpuwarden.commands`` entry points like theirs, so
the core still knows only its extension point.

Modules: ``cli`` (flags), ``run`` (start, view loop, summary, clean stop),
``scenario`` (the scenario files in ``scenarios/``), ``nodes`` (a sim node
with its real agent), ``kubelet`` (the stand-in kubelet), ``workload`` (job
streams and the stand-in training operator), ``faults`` (the fault schedule
and the people who take escalations), ``observe`` (what the API shows, and
the run's history), ``view`` (the live view and plain lines), ``summary``.
"""
