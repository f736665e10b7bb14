from django.urls import path

from charges import refund_views, views

urlpatterns = [
    path("payment_intents", views.payment_intents),
    path("payment_intents/<str:intent_id>", views.payment_intent),
    path("payment_intents/<str:intent_id>/confirm", views.confirm),
    path("payment_intents/<str:intent_id>/capture", views.capture),
    path("payment_intents/<str:intent_id>/cancel", views.cancel),
    path("refunds", refund_views.refunds),
    path("refunds/<str:refund_id>", refund_views.refund),
    path("checkout/sessions", views.checkout_sessions),
    path("checkout/sessions/<str:session_id>", views.checkout_session),
]
