"""Tasks: the YAML format, loading with clear errors, and validation of the suite."""

from .loader import (
    DEFAULT_TASK_DIR,
    TaskError,
    find_task,
    load_task,
    load_tasks,
    reference_function,
    task_files,
)
from .model import InputSpec, ShapePoint, Task, TensorSpec, Tolerance, torch_dtype

__all__ = [
    "DEFAULT_TASK_DIR",
    "InputSpec",
    "ShapePoint",
    "Task",
    "TaskError",
    "TensorSpec",
    "Tolerance",
    "find_task",
    "load_task",
    "load_tasks",
    "reference_function",
    "task_files",
    "torch_dtype",
]
