"""nbgrader configuration for the book's graded assignments.

Run nbgrader from this folder (``make assignments`` does): sources are in ``source/<assignment>/``,
and nbgrader writes ``release/``, ``submitted/``, ``autograded/``, ``feedback/`` and ``gradebook.db``
next to them (all gitignored). See book/instructors.md.
"""

import os
import tempfile
import uuid

c = get_config()  # noqa: F821  (provided by nbgrader when it loads this file)

# The course folder is the folder of this file, wherever the copy lives.
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "rlkit-book"

# Feedback is made from the autograded notebooks, which hold the hidden tests (and their reference
# implementation): strip the hidden regions before rendering it. Tracebacks of failed checks still
# show the failing line.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# nbgrader stops a cell after 30 seconds by default. A test cell of reinforce_baseline trains two small
# agents (a few seconds each on a laptop): give slow or busy machines room.
c.Execute.timeout = 300

# Each grading kernel talks to nbgrader over Unix sockets, not TCP ports: a TCP port is chosen free and
# bound by the kernel a moment later, and on a busy machine another process can take it in between (the
# kernel dies with "Address already in use" and the submission goes ungraded). The sockets' files get an
# absolute name of this run's own: the kernel runs in the submission's folder, and two graders must not
# pick the same file. Windows keeps TCP, the transport Jupyter's kernels support there.
if os.name != "nt":
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(tempfile.gettempdir(), f"nbgrader-{uuid.uuid4().hex[:12]}")
