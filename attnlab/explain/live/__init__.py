"""``attnlab explain --serve``: the explainer as a local web page a learner can play with.

``session.py`` holds the loaded model and answers each request with the explain package's own
checked functions; ``app.py`` is the FastAPI app (the page, its files, the JSON API);
``static/`` holds the hand-written page, script and style, served from the package (nothing
from a CDN, no build step).
"""

from attnlab.explain.live.session import Ask, Session, TooLong

__all__ = ["Ask", "Session", "TooLong"]
