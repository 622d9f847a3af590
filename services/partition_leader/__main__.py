"""`python -m services.partition_leader --node-id ID --zookeeper HOST:PORT --data-dir DIR [--set k=v ...]`"""
from services.common.transport.server import main_for

from .service import setup

if __name__ == "__main__":
    main_for("partition_leader", setup)
