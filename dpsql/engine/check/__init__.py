"""The owner's check of the data files: ``check_data`` (``dpsql check``), never an analyst's."""
