"""nbgrader configuration for the book's graded assignments.

Run nbgrader from this folder (``make assignments`` does): sources are in ``source/<assignment>/``,
and nbgrader writes ``release/``, ``submitted/``, ``autograded/``, ``feedback/`` and ``gradebook.db``
next to them (all gitignored). See book/instructors.md.
"""

import os

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
