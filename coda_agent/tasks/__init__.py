"""Tasks: the YAML format, loading with clear errors, and validation of the suite."""

from .loader import (
    BUILTIN_TASK_DIR,
    TaskError,
    TaskSource,
    discover_task_files,
    find_task,
    load_task,
    load_tasks,
    reference_function,
    task_files,
    task_sources,
)
from .model import InputSpec, ShapePoint, Task, TensorSpec, Tolerance, torch_dtype

__all__ = [
    "BUILTIN_TASK_DIR",
    "InputSpec",
    "ShapePoint",
    "Task",
    "TaskError",
    "TaskSource",
    "TensorSpec",
    "Tolerance",
    "discover_task_files",
    "find_task",
    "load_task",
    "load_tasks",
    "reference_function",
    "task_files",
    "task_sources",
    "torch_dtype",
]
