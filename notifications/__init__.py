"""Notifications: users subscribe to their jobs' events and hear of them by webhook or email."""
