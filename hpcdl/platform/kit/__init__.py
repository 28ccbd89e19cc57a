"""The platform's study wing: what a study may use (docs/architecture.md, "Layers").

Studies and shared code reach it through the face, `hpcdl.platform`; the orchestration wing and the
task apps import its modules directly. Nothing here imports the orchestration wing.
"""
