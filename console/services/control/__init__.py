"""The controller's parts: observe (what runs), cycle (what the policy wants), act (side
effects through the node agents) and record (the decision log and recovery episodes). The
loop that ties them together each tick is console/services/controller.py."""
