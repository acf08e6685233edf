"""What every layer uses: the configuration in force (`config`), the op wrappers (`ops`),
this rank (`ranks`), the registry of what higher layers provide (`registry`), logging and
small helpers."""
