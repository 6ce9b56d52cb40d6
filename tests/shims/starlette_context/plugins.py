class RequestIdPlugin:
    def __init__(self, *a, **k):
        pass
