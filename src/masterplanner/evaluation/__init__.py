"""Evaluations of masterplanner against external benchmark data (read at run time, never copied)."""

from .planning import PlanningReport, evaluate_planning

__all__ = ["PlanningReport", "evaluate_planning"]
