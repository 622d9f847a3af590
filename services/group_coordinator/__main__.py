"""`python -m services.group_coordinator --node-id ID --zookeeper HOST:PORT --data-dir DIR`."""
from services.common.transport.server import main_for

from .service import setup

if __name__ == "__main__":
    main_for("group_coordinator", setup)
