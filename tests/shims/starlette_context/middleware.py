class RawContextMiddleware:
    def __init__(self, app, plugins=()):
        self.app = app
    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)
