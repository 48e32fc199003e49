"""attnlab.tasks: each fine-tuning task in one place: its data format, features and labels,
its recipe, prediction and scores."""
