"""dbapi"""
