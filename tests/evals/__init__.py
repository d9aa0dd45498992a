"""Tests of the evaluation scripts in evals/."""
