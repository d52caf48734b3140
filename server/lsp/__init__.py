"""The codectx language server (pygls). Entry point: `server.serve_cmd`."""
