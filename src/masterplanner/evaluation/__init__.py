"""Evaluations of masterplanner against external benchmark data (read at run time, never copied)."""

from .planning import PlanningReport, Scores, evaluate_baselines, evaluate_planning

__all__ = ["PlanningReport", "Scores", "evaluate_baselines", "evaluate_planning"]
