"""Tests of the nbgrader assignments in notebooks/assignments."""
