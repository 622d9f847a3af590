"""`python -m services.txn_coordinator --node-id ID --zookeeper HOST:PORT --data-dir DIR
[--set key=value ...]`: a transaction coordinator process."""
from services.common.transport.server import main_for

from .service import setup

if __name__ == "__main__":
    main_for("txn_coordinator", setup)
